"""What the labels party keeps: the database's tables (:mod:`.db`) and their migrations (:mod:`.migrations`), the
data directory's files (:mod:`.storage`), label versions (:mod:`.labelstore`), upload and request-body parsing
bounded by what it decodes to (:mod:`.uploads`), and the collection of what crashed processes left
(:mod:`.housekeeping`). It knows nothing of the ledger, releases, HTTP or the runtime (import-linter)."""
