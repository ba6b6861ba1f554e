"""The MCM edge: ``inplace-extension mcm-agent``, the node-side updater of machine-controller-manager's
in-place rollouts (beside the HTTP app, which serves the CAPI hooks). Same engine as the hooks: the plan
and fingerprint of :mod:`inplace_extension.inplace`, the run service of :mod:`inplace_extension.runs`.
"""
