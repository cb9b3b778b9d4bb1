//! Image references as the container runtimes normalise them (`nginx` is
//! `docker.io/library/nginx:latest`), registry mirrors, and the registries reached over plain
//! HTTP. Pure.

use std::collections::BTreeMap;

use oci_client::Reference;

use crate::error::{ImageError, Result};

/// Parses and normalises an image reference.
pub fn parse(image: &str) -> Result<Reference> {
    let fail = |reason: String| ImageError::Reference { reference: image.to_string(), reason };
    if image.is_empty() || image != image.trim() {
        return Err(fail("invalid reference format".into()));
    }
    image.parse::<Reference>().map_err(|e| fail(e.to_string()))
}

/// The normalised name of an image (`docker.io/library/nginx:latest`, or with `@sha256:…`).
pub fn normalise(image: &str) -> Result<String> {
    Ok(parse(image)?.whole())
}

/// One registry mirror: where pulls for a registry go instead (containerd's `hosts.toml`
/// `[host."URL"]`; `podpath up --registry-mirror docker.io=http://10.0.0.5:5000`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// `host[:port]` of the mirror.
    pub host: String,
    /// Reached over plain HTTP (the URL said `http://`).
    pub plain_http: bool,
}

/// Registry settings of a lab: mirrors per registry and the registries reached over plain HTTP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registries {
    pub mirrors: BTreeMap<String, Mirror>,
    /// `host[:port]`s spoken to over HTTP (containerd's `insecure` registries).
    pub plain_http: Vec<String>,
}

impl Registries {
    /// Parses `REGISTRY=URL` (the URL's scheme says HTTP or HTTPS; no path).
    pub fn add_mirror(&mut self, spec: &str) -> Result<()> {
        let bad = |why: &str| {
            ImageError::Config(format!(
                "--registry-mirror {spec:?}: {why} (expected REGISTRY=URL, as docker.io=http://10.0.0.5:5000)"
            ))
        };
        let (registry, url) = spec.split_once('=').ok_or_else(|| bad("no '='"))?;
        let (plain_http, rest) = match url.split_once("://") {
            Some(("http", rest)) => (true, rest),
            Some(("https", rest)) => (false, rest),
            Some(_) => return Err(bad("the URL's scheme must be http or https")),
            None => (false, url),
        };
        let host = rest.trim_end_matches('/');
        if registry.is_empty() || host.is_empty() || host.contains('/') {
            return Err(bad("the registry and the URL's host must be given, and the URL has no path"));
        }
        let registry =
            if registry == "index.docker.io" || registry == "registry-1.docker.io" { "docker.io" } else { registry };
        self.mirrors.insert(registry.to_string(), Mirror { host: host.to_string(), plain_http });
        if plain_http {
            self.plain_http.push(host.to_string());
        }
        Ok(())
    }

    /// The reference as pulled: through the mirror of its registry, if there is one.
    pub fn route(&self, mut r: Reference) -> Reference {
        if let Some(m) = self.mirrors.get(r.registry()) {
            r.set_mirror_registry(m.host.clone());
        }
        r
    }

    /// Whether pulls from `host` use plain HTTP.
    pub fn is_plain_http(&self, host: &str) -> bool {
        self.plain_http.iter().any(|h| h == host)
    }
}

/// The registry a credential of a `.dockerconfigjson` names, normalised as kubelet matches it
/// (`https://index.docker.io/v1/` is Docker Hub).
pub fn credential_registry(key: &str) -> String {
    let k = key.trim_start_matches("https://").trim_start_matches("http://");
    let host = k.split('/').next().unwrap_or(k);
    match host {
        "index.docker.io" | "registry-1.docker.io" | "docker.io" => "docker.io".to_string(),
        h => h.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalised_as_the_runtimes_do() {
        for (given, want) in [
            ("nginx", "docker.io/library/nginx:latest"),
            ("nginx:1.27", "docker.io/library/nginx:1.27"),
            ("library/nginx", "docker.io/library/nginx:latest"),
            ("bitnami/nginx", "docker.io/bitnami/nginx:latest"),
            ("registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10"),
            ("localhost:5000/app", "localhost:5000/app:latest"),
        ] {
            assert_eq!(normalise(given).unwrap(), want, "{given}");
        }
        let d = format!("busybox@sha256:{}", "a".repeat(64));
        assert_eq!(normalise(&d).unwrap(), format!("docker.io/library/busybox@sha256:{}", "a".repeat(64)));
        for bad in ["", "Nginx", "nginx:", "a b", "nginx@sha256:12"] {
            let e = normalise(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("Failed to apply default image tag {bad:?}")), "{e}");
        }
    }

    #[test]
    fn mirrors_route_their_registry_only() {
        let mut r = Registries::default();
        r.add_mirror("docker.io=http://127.0.0.1:5000").unwrap();
        r.add_mirror("quay.io=https://mirror.example:8443/").unwrap();
        assert!(r.is_plain_http("127.0.0.1:5000") && !r.is_plain_http("mirror.example:8443"));
        let routed = r.route(parse("nginx").unwrap());
        assert_eq!(routed.resolve_registry(), "127.0.0.1:5000");
        assert_eq!(routed.repository(), "library/nginx");
        assert_eq!(r.route(parse("ghcr.io/a/b").unwrap()).resolve_registry(), "ghcr.io");
        for bad in ["docker.io", "docker.io=ftp://x", "=http://x", "docker.io=http://x/path"] {
            assert!(Registries::default().add_mirror(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn credential_keys_name_their_registry() {
        assert_eq!(credential_registry("https://index.docker.io/v1/"), "docker.io");
        assert_eq!(credential_registry("registry.example:5000"), "registry.example:5000");
        assert_eq!(credential_registry("http://10.0.0.5:5000/v2/"), "10.0.0.5:5000");
    }
}
