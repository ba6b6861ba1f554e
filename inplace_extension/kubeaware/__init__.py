"""The Kubernetes-aware mode: what a run does in the management and workload clusters around its play.

:class:`inplace_extension.kubeaware.cluster_side.KubeClusterSide` implements the runs layer's
``ClusterSide`` over the Kubernetes adapter (``inplace_extension.kube``): the host address from the live
Machine, the drain before the first disruptive step, ``skip-remediation`` while a disruptive step runs,
the health gate after the play, and Events on the Machine. It keeps no state of its own that matters:
what it did is recorded in the cluster (Node and Machine annotations), so a restarted service undoes it
exactly once.
"""
