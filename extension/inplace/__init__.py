"""The pure core: capabilities, claims, CanUpdate patches, the UpdateMachine plan and its fingerprint.

Takes and returns plain JSON-like data. No I/O, no HTTP, no Ansible.
"""
