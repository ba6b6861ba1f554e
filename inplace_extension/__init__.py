"""inplace-extension: a Cluster API Runtime Extension that updates machines in place with Ansible."""
