//! `kube-public/cluster-info`: the ConfigMap kubeadm-style clusters publish with a kubeconfig
//! naming the API server and its CA. Read with kube's own `Kubeconfig` type rather than an
//! untyped YAML walk.

use kube::config::Kubeconfig;

/// The API server of a cluster-info kubeconfig and its CA (base64 PEM, empty when absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub server: String,
    pub ca_data: String,
}

/// Why a cluster-info kubeconfig names no usable endpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("kube-public/cluster-info's kubeconfig is not a kubeconfig")]
    NotAKubeconfig,
    #[error("kube-public/cluster-info's kubeconfig names no server")]
    NoServer,
}

/// The first cluster's server (the one `kubeadm join` and nodeadm read).
pub fn endpoint(kubeconfig: &str) -> Result<Endpoint, EndpointError> {
    let parsed = Kubeconfig::from_yaml(kubeconfig).map_err(|_| EndpointError::NotAKubeconfig)?;
    let cluster = parsed
        .clusters
        .into_iter()
        .next()
        .and_then(|c| c.cluster)
        .ok_or(EndpointError::NoServer)?;
    let server = cluster
        .server
        .filter(|s| !s.is_empty())
        .ok_or(EndpointError::NoServer)?;
    Ok(Endpoint {
        server,
        ca_data: cluster.certificate_authority_data.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_clusters_server_and_ca() {
        let kc = "apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    \
                  certificate-authority-data: Q0E=\n    server: https://10.0.0.1:6443\n\
                  - name: b\n  cluster:\n    server: https://other\n";
        assert_eq!(
            endpoint(kc),
            Ok(Endpoint {
                server: "https://10.0.0.1:6443".into(),
                ca_data: "Q0E=".into()
            })
        );
    }

    #[test]
    fn no_server_or_not_yaml_is_an_error() {
        assert_eq!(endpoint("clusters: []\n"), Err(EndpointError::NoServer));
        assert_eq!(
            endpoint("clusters:\n- name: a\n  cluster:\n    server: \"\"\n"),
            Err(EndpointError::NoServer)
        );
        assert_eq!(
            endpoint("clusters: [\n"),
            Err(EndpointError::NotAKubeconfig)
        );
    }
}
