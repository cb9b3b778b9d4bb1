//! Image references as the container runtimes normalise them (`nginx` is
//! `docker.io/library/nginx:latest`), registry mirrors, and the registries reached over plain
//! HTTP. Pure.

use std::collections::BTreeMap;

use oci_client::Reference;

use crate::error::{ImageError, Result};

/// Parses and normalises an image reference.
///
/// The grammar is distribution's reference grammar, checked by hand: `oci-spec`'s parser
/// compiles one Unicode regex that stays resident (about 5 MiB in every process that ever
/// parsed a name: each node agent and the image service), more than the rest of an idle agent.
pub fn parse(image: &str) -> Result<Reference> {
    let fail = |reason: &str| ImageError::Reference { reference: image.to_string(), reason: reason.to_string() };
    let (rest, digest) = match image.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (image, None),
    };
    // A tag follows the last ':' after the last '/' (a ':' before it is a registry's port).
    let (name, tag) = match rest.rfind(':') {
        Some(i) if !rest[i..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
        _ => (rest, None),
    };
    if name.is_empty() {
        return Err(fail(if image.is_empty() {
            "repository name must have at least one component"
        } else {
            "invalid reference format"
        }));
    }
    if let Some(t) = tag {
        if !valid_tag(t) {
            return Err(fail("invalid reference format"));
        }
    }
    if let Some(d) = digest {
        check_digest(d).map_err(fail)?;
    }
    // The first component is a registry when it looks like a host (as docker's splitDockerDomain).
    let (registry, path) = match name.split_once('/') {
        Some((first, path))
            if first.contains(['.', ':']) || first == "localhost" || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            (first, path)
        }
        _ => ("docker.io", name),
    };
    if !valid_registry(registry) {
        return Err(fail("invalid reference format"));
    }
    if path.chars().any(|c| c.is_ascii_uppercase()) && path.split('/').all(|c| valid_component(&c.to_ascii_lowercase()))
    {
        return Err(fail("repository name must be lowercase"));
    }
    if !path.split('/').all(valid_component) {
        return Err(fail("invalid reference format"));
    }
    let registry = if registry == "index.docker.io" { "docker.io" } else { registry };
    let repository =
        if registry == "docker.io" && !path.contains('/') { format!("library/{path}") } else { path.to_string() };
    if registry.len() + 1 + repository.len() > NAME_MAX {
        return Err(fail("repository name must not be more than 255 characters"));
    }
    let (registry, digest) = (registry.to_string(), digest.map(str::to_string));
    Ok(match (tag, digest) {
        (Some(t), Some(d)) => Reference::with_tag_and_digest(registry, repository, t.to_string(), d),
        (None, Some(d)) => Reference::with_digest(registry, repository, d),
        (t, None) => Reference::with_tag(registry, repository, t.unwrap_or("latest").to_string()),
    })
}

/// The longest repository name, registry included (distribution's NameTotalLengthMax).
const NAME_MAX: usize = 255;

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`: one path component of a repository.
fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator run: '.', '_', '__' or any number of '-', then an alphanumeric.
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-')) {
            return false;
        }
    }
    true
}

/// `host[:port]`, the host's labels `[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?` joined by dots.
fn valid_registry(r: &str) -> bool {
    let (host, port) = match r.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (r, None),
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|x| x.is_ascii_alphanumeric() || x == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    host.split('.').all(label_ok) && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|x| x.is_ascii_digit()))
}

/// `[\w][\w.-]{0,127}` (ASCII word characters, as Go's regexp reads `\w`).
fn valid_tag(t: &str) -> bool {
    let word = |x: u8| x.is_ascii_alphanumeric() || x == b'_';
    let b = t.as_bytes();
    !b.is_empty() && b.len() <= 128 && word(b[0]) && b.iter().all(|&x| word(x) || x == b'.' || x == b'-')
}

/// `algorithm:encoded` as distribution checks it; sha256/sha512 must be lowercase hex of their length.
fn check_digest(d: &str) -> std::result::Result<(), &'static str> {
    let (alg, hex) = d.split_once(':').ok_or("invalid reference format")?;
    let alg_ok = !alg.is_empty()
        && alg.split(['-', '_', '+', '.']).all(|p| {
            p.bytes().next().is_some_and(|x| x.is_ascii_alphabetic()) && p.bytes().all(|x| x.is_ascii_alphanumeric())
        });
    if !alg_ok || hex.len() < 32 || !hex.bytes().all(|x| x.is_ascii_hexdigit()) {
        return Err("invalid reference format");
    }
    let want = match alg {
        "sha256" => 64,
        "sha512" => 128,
        _ => return Err("unsupported digest algorithm"),
    };
    if !hex.bytes().all(|x| x.is_ascii_digit() || (b'a'..=b'f').contains(&x)) {
        return Err("invalid checksum digest format");
    }
    if hex.len() != want {
        return Err("invalid checksum digest length");
    }
    Ok(())
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
        for (given, want) in [
            ("index.docker.io/nginx", "docker.io/library/nginx:latest"),
            ("localhost/app:v1", "localhost/app:v1"),
            ("my.registry:5000/team/app_x__y--z.v:1.0-rc_1", "my.registry:5000/team/app_x__y--z.v:1.0-rc_1"),
            ("Registry.Example/app", "Registry.Example/app:latest"),
        ] {
            assert_eq!(normalise(given).unwrap(), want, "{given}");
        }
        let both = format!("nginx:1.27@sha256:{}", "b".repeat(64));
        assert_eq!(normalise(&both).unwrap(), format!("docker.io/library/nginx:1.27@sha256:{}", "b".repeat(64)));
        for (bad, reason) in [
            ("", "repository name must have at least one component"),
            ("Nginx", "repository name must be lowercase"),
            ("team/Nginx", "repository name must be lowercase"),
            ("nginx:", "invalid reference format"),
            ("a b", "invalid reference format"),
            (" nginx", "invalid reference format"),
            ("nginx@sha256:12", "invalid reference format"),
            ("nginx@md5:0123456789abcdef0123456789abcdef", "unsupported digest algorithm"),
            ("nginx@sha256:0123456789abcdef0123456789abcdef", "invalid checksum digest length"),
            ("a..b", "invalid reference format"),
            ("a___b", "invalid reference format"),
            ("-a", "invalid reference format"),
            ("a/", "invalid reference format"),
            ("host:port/app", "invalid reference format"),
            ("nginx:.tag", "invalid reference format"),
        ] {
            let e = normalise(bad).unwrap_err().to_string();
            assert!(e.ends_with(reason), "{bad:?}: {e}");
        }
        let long = format!("x/{}", "a".repeat(260));
        assert!(normalise(&long).unwrap_err().to_string().ends_with("must not be more than 255 characters"));
        assert!(normalise(&format!("nginx:{}", "t".repeat(128))).is_ok());
        assert!(normalise(&format!("nginx:{}", "t".repeat(129))).is_err());
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
