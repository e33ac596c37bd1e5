from latencylab.cli import main

raise SystemExit(main())
