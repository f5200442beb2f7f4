"""A job's disk: its limit at launch (`limit`), and the monitor that holds it and
relieves a full store before the image GC (`monitor`)."""
