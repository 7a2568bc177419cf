"""The two parties over HTTP (a labels party with an uploaded dataset and a grant, a trainer) for every test module
of the features party that asks for ``parties`` (defined in test_api.py, where most of its tests are)."""

from tests.features_party.test_api import parties  # noqa: F401
