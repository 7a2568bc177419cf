"""The features party's learners, pure of any service: the MLP (:mod:`.train`, its jitted steps in
:mod:`.train_steps`, its losses in :mod:`.losses`), gradient-boosted trees (:mod:`.gbdt`), the model files both
write and ``labeldp predict`` checks (:mod:`.model_file`, :mod:`.gbdt_file`), shrinkage toward the mean
(:mod:`.shrinkage`), regression targets (:mod:`.targets`) and the predictions' output columns (:mod:`.output`). It
imports no job, storage, HTTP or labels-party client code (an import-linter contract, ``make lint``)."""
