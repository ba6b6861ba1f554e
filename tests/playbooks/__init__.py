"""Tests of playbooks/: the update_machine.yml contract, its modules, and each role on hostlab hosts."""
