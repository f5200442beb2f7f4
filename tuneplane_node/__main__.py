from tuneplane_node.cli import main

raise SystemExit(main())
