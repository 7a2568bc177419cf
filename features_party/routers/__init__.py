"""The trainer's HTTP routes, one router per resource; :mod:`features_party.api` assembles them."""
