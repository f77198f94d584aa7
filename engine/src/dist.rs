//! Delay distribution tables in iproute2's format: signed 16-bit samples of the inverse CDF
//! scaled so that one standard deviation is NETEM_DIST_SCALE (8192). netem (tc) loads them from
//! `<tc lib dir>/<name>.dist`; we do the same and fall back to generating equivalent tables.

use std::sync::Arc;

pub const NETEM_DIST_SCALE: i64 = 8192;
const MAX_DIST: usize = 16 * 1024;
const TC_LIB_DIRS: &[&str] = &["/usr/lib/x86_64-linux-gnu/tc", "/usr/lib/tc", "/usr/lib64/tc", "/usr/local/lib/tc"];

#[derive(Debug)]
pub struct DistTable {
    pub name: String,
    pub table: Vec<i16>,
    /// Where it came from: a file path or "generated".
    pub source: String,
}

/// Parse the text of a .dist file the way tc's get_distribution() does: skip empty lines and
/// lines starting with '#', read every integer on the other lines.
pub fn parse_dist(text: &str) -> Result<Vec<i16>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        for tok in line.split_whitespace() {
            let v: i64 = tok.parse().map_err(|_| format!("bad number {tok:?}"))?;
            if !(i16::MIN as i64..=i16::MAX as i64).contains(&v) {
                return Err(format!("value {v} out of 16-bit range"));
            }
            if out.len() >= MAX_DIST {
                return Err(format!("more than {MAX_DIST} values"));
            }
            out.push(v as i16);
        }
    }
    if out.is_empty() {
        return Err("empty table".into());
    }
    Ok(out)
}

/// Load `name` ("normal", "pareto", "paretonormal") from the tc lib directory (env TC_LIB_DIR
/// first, like tc), else generate it.
pub fn load(name: &str) -> Result<Arc<DistTable>, String> {
    let mut dirs: Vec<String> = Vec::new();
    if let Ok(d) = std::env::var("TC_LIB_DIR") {
        dirs.push(d);
    }
    dirs.extend(TC_LIB_DIRS.iter().map(|s| s.to_string()));
    for d in dirs {
        let path = format!("{d}/{name}.dist");
        if let Ok(text) = std::fs::read_to_string(&path) {
            let table = parse_dist(&text).map_err(|e| format!("{path}: {e}"))?;
            return Ok(Arc::new(DistTable { name: name.into(), table, source: path }));
        }
    }
    let table = generate(name)?;
    Ok(Arc::new(DistTable { name: name.into(), table, source: "generated".into() }))
}

const GEN_SIZE: usize = 4096;

/// Generate a table equivalent to iproute2's: quantiles of the distribution at (i + 0.5) / N,
/// normalised to unit standard deviation, scaled by 8192.
pub fn generate(name: &str) -> Result<Vec<i16>, String> {
    let q: Vec<f64> = (0..GEN_SIZE).map(|i| (i as f64 + 0.5) / GEN_SIZE as f64).collect();
    let raw: Vec<f64> = match name {
        "normal" => q.iter().map(|&p| inv_normal(p)).collect(),
        "pareto" => pareto_quantiles(&q),
        // iproute2's paretonormal mixes 1/4 pareto with 3/4 normal (sum of scaled variates);
        // approximated here by the same mix of quantile functions.
        "paretonormal" => {
            let pa = pareto_quantiles(&q);
            q.iter().zip(pa).map(|(&p, x)| 0.75 * inv_normal(p) + 0.25 * x).collect()
        }
        other => return Err(format!("unknown distribution {other:?}")),
    };
    let n = raw.len() as f64;
    let mean = raw.iter().sum::<f64>() / n;
    let sd = (raw.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    Ok(raw
        .iter()
        .map(|x| ((x - mean) / sd * NETEM_DIST_SCALE as f64).round().clamp(-32768.0, 32767.0) as i16)
        .collect())
}

fn pareto_quantiles(q: &[f64]) -> Vec<f64> {
    // Pareto with shape a = 3 (as iproute2's pareto.c), x = (1 - p)^(-1/a).
    q.iter().map(|&p| (1.0 - p).powf(-1.0 / 3.0)).collect()
}

/// Inverse standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9).
pub fn inv_normal(p: f64) -> f64 {
    const A: [f64; 6] = [-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00];
    const B: [f64; 5] = [-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01, -1.328068155288572e+01];
    const C: [f64; 6] = [-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00];
    const D: [f64; 4] = [7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00];
    let plow = 0.02425;
    if p < plow {
        let q = (-2.0 * p.ln()).sqrt();
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5]) / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    } else if p <= 1.0 - plow {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        let q = (-2.0 * (1.0 - p).ln()).sqrt();
        -(((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5]) / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(t: &[i16]) -> (f64, f64) {
        let n = t.len() as f64;
        let m = t.iter().map(|&x| x as f64).sum::<f64>() / n;
        let sd = (t.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / n).sqrt();
        (m, sd)
    }

    #[test]
    fn parse_skips_comments() {
        let t = parse_dist("# hdr\n 1 -2 3\n\n4\n").unwrap();
        assert_eq!(t, vec![1, -2, 3, 4]);
        assert!(parse_dist("# only\n").is_err());
        assert!(parse_dist("40000\n").is_err());
    }

    #[test]
    fn generated_normal_has_unit_sd() {
        let t = generate("normal").unwrap();
        let (m, sd) = stats(&t);
        assert!(m.abs() < 50.0, "mean {m}");
        assert!((sd / 8192.0 - 1.0).abs() < 0.01, "sd {sd}");
    }

    #[test]
    fn system_normal_table_matches_generated() {
        // Only when iproute2's table is installed: same scale as our generator.
        if let Ok(d) = load("normal") {
            if d.source != "generated" {
                let (m, sd) = stats(&d.table);
                assert!(m.abs() < 100.0, "mean {m}");
                assert!((sd / 8192.0 - 1.0).abs() < 0.05, "sd {sd}");
            }
        }
    }

    #[test]
    fn pareto_tables_generate() {
        for n in ["pareto", "paretonormal"] {
            let t = generate(n).unwrap();
            let (_, sd) = stats(&t);
            // Heavy tail: clamping to 16 bits trims the standard deviation somewhat.
            assert!(sd > 0.6 * 8192.0 && sd < 1.05 * 8192.0, "{n} sd {sd}");
        }
        assert!(generate("weird").is_err());
    }
}
