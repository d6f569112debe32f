//! API errors: an HTTP status and OpenAI's error body `{"error": {"message", "type", "param",
//! "code"}}`. Client mistakes are 4xx with the parameter named; nothing a client sends is a 500.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use protocol::{ErrorBody, ErrorResponse};

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    /// Seconds a client should wait before retrying (503 at capacity).
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    /// 400 about one request parameter.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::new(StatusCode::BAD_REQUEST, message)
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    pub fn overloaded(message: impl Into<String>) -> Self {
        Self {
            retry_after: Some(1),
            ..Self::unavailable(message)
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// The 400 for a body that is not its route's request.
    pub fn field(e: protocol::request::FieldError) -> Self {
        Self {
            param: e.param,
            ..Self::bad_request(e.message)
        }
    }

    /// OpenAI's `type` for the status.
    pub fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "invalid_request_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
            s if s.is_client_error() => "invalid_request_error",
            _ => "internal_error",
        }
    }

    pub fn body(&self) -> ErrorResponse {
        ErrorResponse {
            error: ErrorBody {
                message: self.message.clone(),
                kind: self.kind().to_string(),
                param: self.param.clone(),
                code: Some(self.status.as_u16().into()),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl From<engine::SubmitError> for ApiError {
    fn from(e: engine::SubmitError) -> Self {
        use engine::SubmitError as E;
        match e {
            E::EmptyPrompt => ApiError::invalid("prompt", e.to_string()),
            E::NoTokens | E::OverContext { .. } | E::OverKvCapacity { .. } => {
                ApiError::invalid("max_tokens", e.to_string())
            }
            E::Overloaded(_) => ApiError::overloaded(e.to_string()),
            E::ShuttingDown | E::Stopped => ApiError::unavailable(e.to_string()),
        }
    }
}
