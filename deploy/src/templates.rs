//! The templates, compiled into the binary from the files beside the ones
//! they make (`slurm-conf/*.j2`), rendered strictly: a name the template
//! uses and the context lacks is an error, never an empty string.

use minijinja::{AutoEscape, Environment, UndefinedBehavior};
use serde::Serialize;

use crate::RenderError;

const TEMPLATES: &[(&str, &str)] = &[
    ("slurm.conf", include_str!("../../slurm-conf/slurm.conf.j2")),
    ("gres.conf", include_str!("../../slurm-conf/gres.conf.j2")),
    ("cgroup.conf", include_str!("../../slurm-conf/cgroup.conf.j2")),
    ("policy.toml", include_str!("../../slurm-conf/policy.toml.j2")),
    (
        "job_submit.settings.lua",
        include_str!("../../slurm-conf/job_submit.settings.lua.j2"),
    ),
    ("plugstack.conf", include_str!("../../slurm-conf/plugstack.conf.j2")),
];

/// The gate's body, appended below its rendered settings (not a template:
/// Lua's braces are its own).
pub const GATE_BODY: &str = include_str!("../../slurm-conf/job_submit.lua");

fn environment() -> Result<Environment<'static>, RenderError> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_keep_trailing_newline(true);
    // Values are checked before they get here; no template is HTML or
    // JSON (minijinja would quote every value of a .yml template).
    env.set_auto_escape_callback(|_| AutoEscape::None);
    for (name, text) in TEMPLATES {
        env.add_template(name, text)
            .map_err(|source| RenderError::Template { name: (*name).into(), source })?;
    }
    Ok(env)
}

/// The YAML templates: block tags take their line with them (trim and
/// lstrip blocks), so `{% if %}` lines leave no blank lines behind.
const YAML_TEMPLATES: &[(&str, &str)] = &[("delegate-stack.yml", include_str!("../../stack/delegate-stack.yml.j2"))];

fn yaml_environment() -> Result<Environment<'static>, RenderError> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_keep_trailing_newline(true);
    // Values are checked before they get here; no template is HTML or
    // JSON (minijinja would quote every value of a .yml template).
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    for (name, text) in YAML_TEMPLATES {
        env.add_template(name, text)
            .map_err(|source| RenderError::Template { name: (*name).into(), source })?;
    }
    Ok(env)
}

/// Renders the YAML template `name` with `context`.
pub fn render_yaml<C: Serialize>(name: &str, context: &C) -> Result<String, RenderError> {
    let env = yaml_environment()?;
    let fail = |source| RenderError::Template { name: name.into(), source };
    env.get_template(name).map_err(fail)?.render(context).map_err(fail)
}

/// Renders template `name` with `context`.
pub fn render<C: Serialize>(name: &str, context: &C) -> Result<String, RenderError> {
    let env = environment()?;
    let fail = |source| RenderError::Template { name: name.into(), source };
    env.get_template(name).map_err(fail)?.render(context).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_compiles() {
        environment().unwrap();
        yaml_environment().unwrap();
    }

    #[test]
    fn a_missing_name_is_an_error() {
        #[derive(Serialize)]
        struct Empty {}
        let err = render("plugstack.conf", &Empty {}).unwrap_err().to_string();
        assert!(err.contains("plugstack.conf"), "{err}");
    }
}
