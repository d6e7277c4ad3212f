"""Operating a machine of the cluster: onboarding over SSH, service units, the firewall, wipe."""
