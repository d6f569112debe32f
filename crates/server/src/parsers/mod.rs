//! Output parsers between the engine's text and the OpenAI response: reasoning (the thought
//! goes to `reasoning_content`) and tool calls (`tool_calls`), both streaming.

pub mod reasoning;
pub mod tools;

pub use reasoning::{ReasoningFormat, ReasoningParser, Split};
pub use tools::{ToolEvent, ToolFormat, ToolParser};
