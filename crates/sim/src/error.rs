//! Errors of the simulator, and their OpenAI-style HTTP error bodies.
//!
//! For: every way a request to a simulated instance can fail, with its HTTP
//! status and the `{"error":{"message","type","param","code"}}` body; and invalid
//! instance settings.
//! Not for: logging or retry policy.

use hyper::StatusCode;
use serde_json::json;

/// Why a request to the simulator was refused.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not valid JSON.
    #[error("invalid JSON body: {0}")]
    InvalidJson(#[from] serde_json::Error),
    /// The body is JSON but not a valid request of this endpoint.
    #[error("{message}")]
    InvalidRequest {
        /// Human-readable reason.
        message: String,
        /// The offending field, when there is one.
        param: Option<&'static str>,
    },
    /// Prompt plus output exceed `max_model_len`, or need more KV blocks than the instance has.
    #[error(
        "This model's maximum context length is {limit} tokens. However, you requested \
         {total} tokens ({prompt} in the messages, {output} in the completion). \
         Please reduce the length of the messages or completion."
    )]
    TooLong {
        /// The limit in tokens (the smaller of `max_model_len` and the KV cache size).
        limit: usize,
        /// Prompt tokens plus output tokens.
        total: usize,
        /// Prompt tokens.
        prompt: usize,
        /// Requested output tokens.
        output: usize,
    },
    /// The request body is larger than the simulator accepts.
    #[error("request body exceeds {limit} bytes")]
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The body could not be read from the connection.
    #[error("could not read the request body: {0}")]
    BodyRead(String),
    /// No such endpoint.
    #[error("no route for {0}")]
    NotFound(String),
    /// The endpoint exists but not with this method.
    #[error("method {method} not allowed for {path}")]
    MethodNotAllowed {
        /// The request method.
        method: String,
        /// The request path.
        path: String,
    },
    /// The instance is shutting down.
    #[error("the simulated engine is not running")]
    EngineGone,
}

impl ApiError {
    /// An [`ApiError::InvalidRequest`] about `param`.
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            message: message.into(),
            param: Some(param),
        }
    }

    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidJson(_) | Self::InvalidRequest { .. } | Self::TooLong { .. } => {
                StatusCode::BAD_REQUEST
            }
            Self::BodyRead(_) => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::EngineGone => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_type(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not_found_error",
            Self::EngineGone => "service_unavailable_error",
            _ => "invalid_request_error",
        }
    }

    fn param(&self) -> Option<&'static str> {
        match self {
            Self::InvalidRequest { param, .. } => *param,
            Self::TooLong { .. } => Some("messages"),
            _ => None,
        }
    }

    /// The OpenAI error body: `{"error":{"message","type","param","code"}}`, `code` being the HTTP status.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.to_string(),
            "type": self.error_type(),
            "param": self.param(),
            "code": self.status().as_u16(),
        }})
    }
}

/// Why a [`super::SimConfig`] cannot run.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SimConfigError {
    /// A count or size that must be at least 1 is 0.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// A rate or scale that must be a positive finite number is not.
    #[error("{0} must be a positive finite number")]
    NotPositive(&'static str),
    /// A duration that must be a finite number >= 0 is not.
    #[error("{0} must be a finite number >= 0")]
    Negative(&'static str),
}

impl From<SimConfigError> for std::io::Error {
    fn from(err: SimConfigError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, err)
    }
}
