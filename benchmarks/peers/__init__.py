"""Peer servers of the benchmarks. ``text_servers`` holds the specs serve_vs_peers.py imports; the other files
are what each peer runs, most in its own venv under benchmarks/.venvs/ (made by the ``*_setup.sh`` scripts)."""
