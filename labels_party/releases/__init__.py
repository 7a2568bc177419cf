"""Private releases. :mod:`.transaction` owns the release transaction (idempotency, label snapshot, coverage,
budget check, charge, audit record, visibility); each release kind in :mod:`.kinds` is a small strategy that turns
a snapshot into a draft; :mod:`.queries` reads releases back for the organizations allowed to see them."""
