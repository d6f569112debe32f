//! The built-in `rewrite` dataset: requests whose answer repeats much of the prompt (copy a file
//! back with a small change, repeat a notice, restate a document), as in code editing and
//! retrieval-augmented answers. Speculative decoding by prompt lookup (n-gram) thrives on it.
//!
//! Each passage is long enough (about 200–300 tokens) that a faithful copy fills the default
//! 200-token answer: with short passages a small model finishes the copy early and, with
//! `ignore_eos`, spends the rest of the answer on unrelated text that nothing can predict.

use super::Prompt;

/// Passages (code and prose) the instructions apply to; the first `CODE_PASSAGES` are code
/// (the `edit` dataset's turn-one answers).
pub(super) const PASSAGES: &[&str] = &[
    r#"def total_price(items, tax_rate, discount=None):
    """Return the price of an order, tax included."""
    subtotal = 0
    for item in items:
        if item.quantity <= 0:
            raise ValueError(f"bad quantity for {item.name}: {item.quantity}")
        subtotal += item.price * item.quantity
    if discount is not None:
        if discount.kind == "percent":
            subtotal -= subtotal * discount.amount / 100
        elif discount.kind == "fixed":
            subtotal -= discount.amount
        else:
            raise ValueError(f"unknown discount kind: {discount.kind}")
    subtotal = max(subtotal, 0)
    tax = subtotal * tax_rate
    return round(subtotal + tax, 2)


def order_summary(order):
    lines = []
    for item in order.items:
        lines.append(f"{item.quantity} x {item.name} at {item.price:.2f}")
    lines.append(f"total: {total_price(order.items, order.tax_rate):.2f}")
    return "\n".join(lines)
"#,
    r#"fn parse_port(s: &str) -> Result<u16, String> {
    let n: u32 = s
        .trim()
        .parse()
        .map_err(|e| format!("not a number: {e}"))?;
    if n == 0 || n > 65535 {
        return Err(format!("port {n} out of range"));
    }
    Ok(n as u16)
}

fn parse_address(s: &str) -> Result<(String, u16), String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("expected HOST:PORT, got {s}"))?;
    if host.is_empty() {
        return Err("the host is empty".to_string());
    }
    Ok((host.to_string(), parse_port(port)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ports() {
        assert_eq!(parse_port("8080"), Ok(8080));
        assert!(parse_port("0").is_err());
        assert!(parse_port("70000").is_err());
        assert!(parse_port("http").is_err());
    }
}
"#,
    r#"function debounce(fn, wait) {
  let timer = null;
  return function (...args) {
    clearTimeout(timer);
    timer = setTimeout(() => fn.apply(this, args), wait);
  };
}

function throttle(fn, interval) {
  let last = 0;
  let pending = null;
  return function (...args) {
    const now = Date.now();
    const remaining = interval - (now - last);
    if (remaining <= 0) {
      last = now;
      fn.apply(this, args);
    } else if (pending === null) {
      pending = setTimeout(() => {
        last = Date.now();
        pending = null;
        fn.apply(this, args);
      }, remaining);
    }
  };
}

const search = debounce((query) => {
  fetch(`/api/search?q=${encodeURIComponent(query)}`)
    .then((response) => response.json())
    .then((results) => render(results));
}, 300);
"#,
    r#"class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if self.is_empty():
            raise IndexError("pop from an empty stack")
        return self.items.pop()

    def peek(self):
        if self.is_empty():
            raise IndexError("peek at an empty stack")
        return self.items[-1]

    def is_empty(self):
        return len(self.items) == 0

    def __len__(self):
        return len(self.items)


class Queue:
    def __init__(self):
        self.items = []

    def enqueue(self, item):
        self.items.append(item)

    def dequeue(self):
        if not self.items:
            raise IndexError("dequeue from an empty queue")
        return self.items.pop(0)

    def __len__(self):
        return len(self.items)
"#,
    r#"SELECT customers.name,
       customers.email,
       COUNT(orders.id) AS order_count,
       SUM(orders.total) AS total_spent
FROM customers
JOIN orders ON orders.customer_id = customers.id
WHERE orders.created_at >= '2024-01-01'
  AND orders.status = 'paid'
GROUP BY customers.name, customers.email
HAVING COUNT(orders.id) >= 3
ORDER BY total_spent DESC
LIMIT 10;

SELECT products.name,
       SUM(order_items.quantity) AS units_sold
FROM products
JOIN order_items ON order_items.product_id = products.id
JOIN orders ON orders.id = order_items.order_id
WHERE orders.created_at >= '2024-01-01'
GROUP BY products.name
ORDER BY units_sold DESC
LIMIT 20;
"#,
    r#"#!/bin/sh
set -eu
log_dir="/var/log/app"
archive_dir="$log_dir/archive"
mkdir -p "$archive_dir"
for file in "$log_dir"/*.log; do
  [ -e "$file" ] || continue
  name=$(basename "$file")
  gzip -9 "$file"
  mv "$file.gz" "$archive_dir/$name.$(date +%Y%m%d).gz"
done
count=$(ls "$archive_dir" | wc -l)
echo "archived logs: $count files in $archive_dir"
find "$archive_dir" -name '*.gz' -mtime +30 -print -delete
echo "removed archives older than thirty days"
"#,
    "The library opens at nine in the morning and closes at six in the evening on weekdays. On \
     Saturdays it opens at ten and closes at four. It is closed on Sundays and public holidays. \
     Books can be borrowed for three weeks and renewed twice, online or at the front desk. Films \
     and music can be borrowed for one week and cannot be renewed. Late returns cost twenty cents \
     a day for each item, up to five euros. Members can reserve up to ten items at a time; we will \
     send an email when a reserved item is ready, and it will wait for you at the front desk for \
     seven days. The reading room on the first floor is quiet at all times. Group study rooms on \
     the second floor can be booked for two hours a day. Printing costs ten cents a page in black \
     and white and fifty cents a page in colour. Wireless internet is free for everyone; ask at \
     the front desk for the password. Children under eight must be with an adult at all times.",
    "To reset your password, open the settings page, choose Security, and press Reset Password. \
     We will send a link to your email address. The link expires after thirty minutes, so use it \
     soon. If the email does not arrive, check your spam folder before asking for a new link. \
     When you open the link, choose a new password of at least twelve characters. Do not use a \
     password you have used before on this site. After you save the new password, you will be \
     signed out on every device, and you will need to sign in again with the new password. If you \
     turned on two-step verification, you will also need the code from your phone. If you lost \
     your phone, use one of the backup codes you saved when you turned on two-step verification. \
     If you have no backup codes, contact support from the email address on your account, and we \
     will check your identity before we turn off two-step verification for you.",
    "Our team meets every Monday at ten to plan the week. Each person shares what they finished, \
     what they will work on next, and anything that blocks them. Meetings last at most thirty \
     minutes. Notes are written in the shared document and sent to everyone after the meeting. \
     On Wednesdays at three we hold a review, where each person shows one piece of work to the \
     rest of the team and asks for comments. On Fridays at four we look back at the week: what \
     went well, what went badly, and what we will change next week. Anyone can add a topic to the \
     agenda of any meeting by writing it in the shared document before the meeting starts. If you \
     cannot come to a meeting, write your update in the shared document instead. New members of \
     the team meet their mentor every day for the first two weeks, and once a week after that.",
    "Dear customer, thank you for your order. Your package left our warehouse today and should \
     arrive within three to five business days. You can follow it with the tracking number in \
     this email. If anything is wrong with your order, reply to this message and we will help. \
     If you are not at home when the package arrives, the driver will leave a card with the \
     address of the nearest pick-up point, where your package will wait for you for ten days. \
     You can return any item within thirty days of delivery, as long as it is unused and in its \
     original packaging. To return an item, print the return label from your account page, stick \
     it on the package, and take it to any pick-up point. We will refund the price of the item to \
     your card within five business days of receiving it. Thank you for shopping with us, and we \
     hope to see you again soon.",
    "The river starts in the mountains as a small stream fed by melting snow. It grows as it \
     collects water from many smaller streams, passes through three towns, and turns a mill that \
     has ground flour for two hundred years. Below the mill the valley opens up, and the river \
     slows down and winds through fields of wheat and sunflowers. Herons stand in the shallow \
     water, and in summer children swim near the old stone bridge. After the bridge the river \
     joins a larger river coming from the east, and together they become wide enough for boats. \
     For centuries boats carried wood, wine and grain down to the coast, and the towns along the \
     banks grew rich from the trade. Today most of the boats carry tourists. Finally the river \
     reaches the sea near an old lighthouse, where it spreads into a delta of marshes and sandy \
     islands that are home to thousands of birds in winter.",
    "Photosynthesis is the process plants use to turn light into chemical energy. Leaves take in \
     carbon dioxide from the air and water from the roots. Using sunlight, they make sugar and \
     release oxygen. The sugar feeds the plant, and the oxygen is what animals breathe. The \
     process happens in chloroplasts, small structures inside the cells of the leaf. Chloroplasts \
     contain chlorophyll, a green pigment that absorbs red and blue light and reflects green light, \
     which is why leaves look green. Photosynthesis has two stages. In the first stage, light \
     energy splits water molecules, releasing oxygen and storing energy in two carrier molecules. \
     In the second stage, called the Calvin cycle, the plant uses that stored energy to turn \
     carbon dioxide into sugar. Plants store some of the sugar as starch, and use the rest to grow \
     and to build the cellulose in their cell walls.",
];

/// How many of `PASSAGES`, from the first, are code.
pub(super) const CODE_PASSAGES: usize = 6;

/// What to do with a passage; each keeps (nearly) all of it in the answer.
const INSTRUCTIONS: &[&str] = &[
    "Repeat the following text exactly as it is, without any comment:",
    "Here is a text. Write it out again in full, unchanged, so that I can copy it:",
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
