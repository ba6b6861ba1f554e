"""Hook handlers: one module per CAPI hook. They compose ``inplace`` and ``runs``; no HTTP, no Ansible details."""
