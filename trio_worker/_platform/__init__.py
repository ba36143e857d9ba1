"""The client side of the worker protocol (docs/protocol.md §2); its modules are in
docs/how-it-works.md, "Module map". It imports nothing above it: data flows from the
supervisor down into this package, never back.
"""
