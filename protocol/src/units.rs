//! Human units on the command line and in the policy file: sizes (`512M`,
//! `4G`, `1048576`) and durations (`5s`, `10m`, `1h30m`, `90` = seconds).

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UnitError {
    #[error("{0:?} is not a size (examples: 512M, 4G, 1048576)")]
    Size(String),
    #[error("{0:?} is not a duration (examples: 5s, 10m, 1h30m)")]
    Duration(String),
}

/// Bytes from `N`, `NK`, `NM`, `NG`, `NT` (powers of 1024; a trailing `B`,
/// `iB` or lower case is accepted).
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let err = || UnitError::Size(s.to_owned());
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| err())?;
    let mul: u64 = match unit.to_ascii_uppercase().as_str() {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(err()),
    };
    n.checked_mul(mul).filter(|v| *v > 0).ok_or_else(err)
}

/// Seconds from a sequence of `<n><unit>` with units d, h, m, s; a bare
/// number is seconds.
pub fn parse_duration(s: &str) -> Result<u64, UnitError> {
    let err = || UnitError::Duration(s.to_owned());
    let t = s.trim();
    if t.is_empty() {
        return Err(err());
    }
    if let Ok(n) = t.parse::<u64>() {
        return if n > 0 { Ok(n) } else { Err(err()) };
    }
    let mut total: u64 = 0;
    let mut num = String::new();
    for c in t.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: u64 = num.parse().map_err(|_| err())?;
        num.clear();
        let mul = match c {
            'd' => 86_400,
            'h' => 3_600,
            'm' => 60,
            's' => 1,
            _ => return Err(err()),
        };
        total = n.checked_mul(mul).and_then(|v| total.checked_add(v)).ok_or_else(err)?;
    }
    if !num.is_empty() || total == 0 {
        return Err(err());
    }
    Ok(total)
}

/// `1536` -> `1.5K`; for messages.
pub fn format_size(b: u64) -> String {
    const U: [&str; 5] = ["", "K", "M", "G", "T"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if v.fract() == 0.0 {
        format!("{}{}", v as u64, U[i])
    } else {
        format!("{:.1}{}", v, U[i])
    }
}

/// `3725` -> `1h2m5s`.
pub fn format_duration(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out += &format!("{h}h");
    }
    if m > 0 {
        out += &format!("{m}m");
    }
    if s > 0 || out.is_empty() {
        out += &format!("{s}s");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert_eq!(parse_size("100"), Ok(100));
        for bad in ["", "0", "12X", "-1G", "99999999999T"] {
            assert_eq!(parse_size(bad), Err(UnitError::Size(bad.to_owned())));
        }
        assert_eq!(format_size(1536), "1.5K");
        assert_eq!(format_size(4 << 30), "4G");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Ok(5));
        assert_eq!(parse_duration("90"), Ok(90));
        assert_eq!(parse_duration("10m"), Ok(600));
        assert_eq!(parse_duration("1h30m"), Ok(5400));
        assert_eq!(parse_duration("1d"), Ok(86400));
        for bad in ["5x", "m", "5s3", "0s"] {
            assert_eq!(parse_duration(bad), Err(UnitError::Duration(bad.to_owned())));
        }
        assert_eq!(format_duration(3725), "1h2m5s");
        assert_eq!(format_duration(0), "0s");
    }
}
