"""Real boards over SSH: the inventory (inventory.py), a node over SSH carrying the lab agent
(sshnode.py), a lab built on boards with everything it changes recorded and restored
(boardlab.py), and an emulated board farm with real sshd for tests and dry runs (farm.py).
See docs/boards.md.
"""
