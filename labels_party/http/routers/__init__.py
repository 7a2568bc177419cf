"""The labels party's HTTP routes, one router per resource; :mod:`labels_party.http.api` assembles them."""
