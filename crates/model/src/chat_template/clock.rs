//! Dates for templates (`strftime_now`, `date_string`, `datetime`): a small UTC `strftime`.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A UTC calendar time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    /// 0 = Monday.
    weekday: u32,
    /// 1-based day of the year.
    yday: u32,
}

fn civil(t: SystemTime) -> Civil {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = before[month as usize - 1] + day + u32::from(leap && month > 2);
    Civil {
        year,
        month,
        day,
        hour: (rem / 3600) as u32,
        minute: (rem / 60 % 60) as u32,
        second: (rem % 60) as u32,
        // 1970-01-01 was a Thursday.
        weekday: (days + 3).rem_euclid(7) as u32,
        yday,
    }
}

/// C's `strftime` for the common directives, in UTC. Unknown directives are kept as written.
pub fn strftime(t: SystemTime, format: &str) -> String {
    let c = civil(t);
    let month = MONTHS[c.month as usize - 1];
    let weekday = DAYS[c.weekday as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(ch) = chars.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let hour12 = if c.hour.is_multiple_of(12) {
            12
        } else {
            c.hour % 12
        };
        let s = match d {
            'Y' => c.year.to_string(),
            'y' => format!("{:02}", c.year.rem_euclid(100)),
            'm' => format!("{:02}", c.month),
            'd' => format!("{:02}", c.day),
            'e' => format!("{:2}", c.day),
            'j' => format!("{:03}", c.yday),
            'H' => format!("{:02}", c.hour),
            'I' => format!("{hour12:02}"),
            'M' => format!("{:02}", c.minute),
            'S' => format!("{:02}", c.second),
            'p' => (if c.hour < 12 { "AM" } else { "PM" }).to_string(),
            'B' => month.to_string(),
            'b' | 'h' => month[..3].to_string(),
            'A' => weekday.to_string(),
            'a' => weekday[..3].to_string(),
            'u' => (c.weekday + 1).to_string(),
            'w' => ((c.weekday + 1) % 7).to_string(),
            'F' => format!("{}-{:02}-{:02}", c.year, c.month, c.day),
            'T' => format!("{:02}:{:02}:{:02}", c.hour, c.minute, c.second),
            'Z' => "UTC".to_string(),
            'z' => "+0000".to_string(),
            '%' => "%".to_string(),
            other => format!("%{other}"),
        };
        out.push_str(&s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn known_dates() {
        let t = UNIX_EPOCH + Duration::from_secs(1_715_949_296); // 2024-05-17 12:34:56 UTC, Friday
        assert_eq!(strftime(t, "%Y-%m-%d %H:%M:%S"), "2024-05-17 12:34:56");
        assert_eq!(strftime(t, "%d %b %Y"), "17 May 2024");
        assert_eq!(strftime(t, "%b %d %Y"), "May 17 2024");
        assert_eq!(
            strftime(t, "%A %a %B %j %I%p %%"),
            "Friday Fri May 138 12PM %"
        );
        assert_eq!(strftime(UNIX_EPOCH, "%F %a %Q"), "1970-01-01 Thu %Q");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(strftime(leap, "%F %j"), "2000-02-29 060");
    }
}
