/** Namespace of the hub's own objects: install-wide AddOnDeploymentConfig, replica and manager leases. */
export const HUB_NAMESPACE = 'open-cluster-management-cluster-proxy';

/** The install-wide AddOnDeploymentConfig (egress proxy settings, node placement). */
export const DEPLOYMENT_CONFIG = { name: 'cluster-proxy', namespace: HUB_NAMESPACE } as const;
