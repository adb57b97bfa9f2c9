/** Namespace of the hub's own objects: install-wide AddOnDeploymentConfig, replica and manager leases. */
export const HUB_NAMESPACE = 'open-cluster-management-cluster-proxy';
