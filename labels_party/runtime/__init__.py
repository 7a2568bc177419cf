"""The labels party as a running process: settings (:mod:`.settings`), the context built once per process
(:mod:`.context`), the command line (:mod:`.cli`), job leases and workers (:mod:`.jobs`, :mod:`.workers`), start-up
recovery (:mod:`.recovery`) and per-organization release quotas (:mod:`.quotas`)."""
