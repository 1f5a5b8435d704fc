"""Real-SSH test infrastructure: Debian's OpenSSH sshd on loopback and in network namespaces.

``sshd`` starts and breaks servers, ``netns`` makes test hosts with their own addresses,
``fixtures`` has the pytest fixtures (import them explicitly in a test module). See docs/testing.md.
"""
