"""``python -m latencylab.optimize.experiments``: an alias of ``latencylab experiment``."""

from latencylab.optimize.experiments.frontend import main

raise SystemExit(main())
