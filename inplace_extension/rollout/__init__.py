"""``status``'s live view of a rollout: where each Machine's update stands, read from the record the
service keeps (the ``local`` executor's runs dir: ``local``; the management cluster's Machines, their
conditions, the ``kubernetes`` executor's record annotation and the service's Events: ``cluster``), said
as a table or JSON (``render``). Read-only: nothing here writes anywhere."""
