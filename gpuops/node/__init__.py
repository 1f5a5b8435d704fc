"""The node side: runs on GPU servers. Imports only the standard library, pynvml and core/."""
