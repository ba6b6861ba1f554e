"""The pure core: capabilities, claims, CanUpdate patches, the UpdateMachine plan and its fingerprint.

Takes and returns plain JSON-like data. No I/O, no HTTP, no Ansible.

Public entry points: ``decide.decide_can_update_machine`` / ``decide.decide_can_update_machine_set``
(-> ``Decision``) and ``plan.plan_update`` (-> ``Plan``, raises ``PlanError``). ``capabilities.CAPABILITIES``
is the one table of what can change in place; the other modules serve it: ``objects`` (request roles and
spec roots), ``pointers`` (JSON pointers, equality), ``patches`` (claims -> RFC 6902 ops), ``guards``
(why a change is not claimed), ``versions``, ``files`` and ``entries`` (KubeadmConfig values -> role
inputs), ``inputs`` (declared input types and their extraction for the plan).
"""
