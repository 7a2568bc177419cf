"""The DP mathematics of the labels party: mechanism families and their registry (:mod:`.registry`), the exact
solvers (:mod:`.solvers`), the private prior (:mod:`.prior`), the release pipeline from a prior to sampled labels
(:mod:`.pipeline`), and the central releases' algorithms (private evaluation, quantiles, LabelDP-Pro, PATE). It
imports only :mod:`shared`: no storage, ledger, HTTP or runtime (an import-linter contract, ``make lint``)."""
