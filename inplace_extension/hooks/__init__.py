"""Hook handlers: one module per CAPI hook, plus ``table.py`` (HOOKS, which routes and Discovery derive from).

Handlers compose ``inplace`` (pure decisions) and the injected executor (runs); they see wire models,
never Starlette objects, HTTP details or Ansible.
"""
