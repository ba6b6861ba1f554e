"""kubelab: a real Kubernetes control plane for tests, built from Go modules (the Kubernetes side of hostlab).

etcd, kube-apiserver and kube-controller-manager are real upstream code; kwok stands in for kubelets
(it keeps Nodes labelled ``type=kwok`` Ready and their Pods Running). Flavours add the real CAPI and
MCM controllers on top. See docs/development.md, section "Kubernetes lab".

Modules: :mod:`kubelab.config` (where things live), :mod:`kubelab.build` (the binaries table and the
cached, locked builds), :mod:`kubelab.pki` (certificates), :mod:`kubelab.components` (how each core
process is started and checked), :mod:`kubelab.state` (the lab's state file), :mod:`kubelab.lab`
(``Lab``: up/down/status and faults), :mod:`kubelab.flavours` (the flavour table), the CLI
:mod:`kubelab.cli` and the pytest plugin :mod:`kubelab.pytest_plugin`.
"""
