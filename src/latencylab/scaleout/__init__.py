"""Scale-out on Ray (issue 20): distributed load generation.

* ``split``: one arrival process as N per-worker streams whose superposition is the requested one.
* ``skew``: each worker's clock offset from round trips, and the common start instant in its clock.
* ``merge``: per-worker parts (HDR histograms, counts, lateness) into one ``load`` result plus a breakdown.
* ``load_ray``: the generator actor and the driver (``latencylab load --ray [ADDRESS] --workers N``).

Only ``load_ray`` imports ``ray`` (lazily, when a distributed run is asked for); the rest is pure.
"""
