"""The benchmark suite: the bridge against minimal baseline servers (see bench/README.md).

Not part of the bridge package, its tests or CI. Imports ``bridge`` only in the runner (never in
the baselines, the clients or the fast agent).
"""
