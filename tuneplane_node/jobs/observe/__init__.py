"""What a console reads of its jobs: views, the watch, logs (followed), stats, results."""
