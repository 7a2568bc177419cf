"""The labels party's HTTP layer: the app (:mod:`.api`), who may do what (:mod:`.access`, decided once by the
gatekeeper before a body is read), API keys (:mod:`.auth`), the audit's views (:mod:`.audit`), thin routers per
resource (:mod:`.routers`) and the owner's console (:mod:`.console`). Nothing below it imports its routes."""
