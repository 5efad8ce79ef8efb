pub struct KubeCluster;
