//! The built-in `rewrite` dataset: requests whose answer repeats much of the prompt (fix the
//! spelling, copy a function with a small change, extract a paragraph), as in code editing and
//! retrieval-augmented answers. Speculative decoding by prompt lookup (n-gram) thrives on it.

use super::Prompt;

/// Passages (prose and code) the instructions apply to.
const PASSAGES: &[&str] = &[
    "The library opens at nine in the morning and closes at six in the evening on weekdays. On \
     Saturdays it opens at ten and closes at four. It is closed on Sundays and public holidays. \
     Books can be borrowed for three weeks and renewed twice, online or at the front desk.",
    "def total_price(items, tax_rate):\n    subtotal = 0\n    for item in items:\n        \
     subtotal += item.price * item.quantity\n    tax = subtotal * tax_rate\n    return subtotal + tax\n",
    "To reset your password, open the settings page, choose Security, and press Reset Password. \
     We will send a link to your email address. The link expires after thirty minutes, so use it \
     soon. If the email does not arrive, check your spam folder before asking for a new link.",
    "fn parse_port(s: &str) -> Result<u16, String> {\n    let n: u32 = s.trim().parse().map_err(|e| \
     format!(\"not a number: {e}\"))?;\n    if n == 0 || n > 65535 {\n        return Err(format!(\"port \
     {n} out of range\"));\n    }\n    Ok(n as u16)\n}\n",
    "The river starts in the mountains as a small stream fed by melting snow. It grows as it \
     collects water from many smaller streams, passes through three towns, and turns a mill that \
     has ground flour for two hundred years. Finally it reaches the sea near an old lighthouse.",
    "SELECT customers.name, COUNT(orders.id) AS order_count\nFROM customers\nJOIN orders ON \
     orders.customer_id = customers.id\nWHERE orders.created_at >= '2024-01-01'\nGROUP BY \
     customers.name\nORDER BY order_count DESC\nLIMIT 10;\n",
    "Our team meets every Monday at ten to plan the week. Each person shares what they finished, \
     what they will work on next, and anything that blocks them. Meetings last at most thirty \
     minutes. Notes are written in the shared document and sent to everyone after the meeting.",
    "function debounce(fn, wait) {\n  let timer = null;\n  return function (...args) {\n    \
     clearTimeout(timer);\n    timer = setTimeout(() => fn.apply(this, args), wait);\n  };\n}\n",
    "Photosynthesis is the process plants use to turn light into chemical energy. Leaves take in \
     carbon dioxide from the air and water from the roots. Using sunlight, they make sugar and \
     release oxygen. The sugar feeds the plant, and the oxygen is what animals breathe.",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        \
     self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n\n    def \
     is_empty(self):\n        return len(self.items) == 0\n",
    "Dear customer, thank you for your order. Your package left our warehouse today and should \
     arrive within three to five business days. You can follow it with the tracking number in \
     this email. If anything is wrong with your order, reply to this message and we will help.",
    "#!/bin/sh\nset -e\nfor file in *.log; do\n  gzip -9 \"$file\"\n  mv \"$file.gz\" archive/\n\
     done\necho \"archived $(ls archive | wc -l) files\"\n",
];

/// What to do with a passage; each keeps most of it in the answer.
const INSTRUCTIONS: &[&str] = &[
    "Repeat the following text exactly as it is, without any comment:",
    "Rewrite the following text with every sentence or line kept the same, but in a numbered list \
     (one item per sentence or line):",
    "Copy the following text and change nothing except to make the first word upper case:",
];

pub fn prompts() -> Vec<Prompt> {
    INSTRUCTIONS
        .iter()
        .flat_map(|i| {
            PASSAGES
                .iter()
                .map(move |p| Prompt::Text(format!("{i}\n\n{p}")))
        })
        .collect()
}
