"""The labels party's HTTP routes, one router per resource; :mod:`labels_party.api` assembles them."""
