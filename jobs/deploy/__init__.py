"""Deployments: a provisioned NVFlare edge hierarchy on this machine (``local``) or across hosts
(``multi_host``), built from NVFlare's provisioning (``provisioning``), processes in sessions of their own
(``sessions``), the admin API (``admin``) and NVFlare's routing proxy for real devices (``device_proxy``).

``python -m jobs.deploy`` is the command line (``jobs.deploy.cli``)."""
