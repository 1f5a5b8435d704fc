"""Fixtures shared by every test directory."""

# The real-SSH fixtures (sshd on loopback, hosts in network namespaces): see docs/testing.md.
pytest_plugins = ["tests.sshtest.fixtures"]
