//! The image crate's one error type.

/// Errors of pulling, storing and serving images. Each names the image (its normalised
/// reference) or the file it concerns; the texts are the ones a pod's status and Events show.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// Not an image reference (kubelet's `InvalidImageName`).
    #[error("Failed to apply default image tag {reference:?}: couldn't parse image name {reference:?}: {reason}")]
    Reference { reference: String, reason: String },
    /// The registry answered the manifest request with an error, or could not be reached.
    #[error("failed to pull and unpack image {image:?}: failed to resolve reference {image:?}: {message}")]
    Resolve { image: String, message: String },
    /// A layer or config blob failed: download, digest, size or content.
    #[error("failed to pull and unpack image {image:?}: failed to extract layer {digest}: {reason}")]
    Layer { image: String, digest: String, reason: String },
    /// No manifest for this node's platform.
    #[error("failed to pull and unpack image {image:?}: no match for platform in manifest: {platform} is not among {offered}")]
    Platform { image: String, platform: String, offered: String },
    /// `imagePullPolicy: Never` (or `image pull --never`) and the image is not in the store.
    #[error("Container image {image:?} is not present with pull policy of Never")]
    NotPresent { image: String },
    /// A file of the store, or an archive, could not be read or written.
    #[error("cannot {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// An archive (`podpath image load`) that is not a `docker save` or OCI layout tar.
    #[error("{path}: {reason}")]
    Archive { path: String, reason: String },
    /// Bad configuration (a mirror, a limit).
    #[error("{0}")]
    Config(String),
    /// The lab's image service could not be reached or answered an error.
    #[error("image service: {0}")]
    Service(String),
}

impl ImageError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> ImageError {
        ImageError::Io { what: what.into(), source }
    }
}

pub type Result<T> = std::result::Result<T, ImageError>;
