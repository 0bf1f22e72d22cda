"""Sandbox tests (a package, so this folder's conftest does not shadow ``tests/conftest``)."""
