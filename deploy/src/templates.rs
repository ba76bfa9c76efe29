//! The templates, compiled into the binary from the files beside the ones
//! they make (`slurm-conf/*.j2`), rendered strictly: a name the template
//! uses and the context lacks is an error, never an empty string.

use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;

use crate::RenderError;

const TEMPLATES: &[(&str, &str)] = &[
    ("slurm.conf", include_str!("../../slurm-conf/slurm.conf.j2")),
    ("gres.conf", include_str!("../../slurm-conf/gres.conf.j2")),
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
    for (name, text) in TEMPLATES {
        env.add_template(name, text)
            .map_err(|source| RenderError::Template { name: (*name).into(), source })?;
    }
    Ok(env)
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
    }

    #[test]
    fn a_missing_name_is_an_error() {
        #[derive(Serialize)]
        struct Empty {}
        let err = render("plugstack.conf", &Empty {}).unwrap_err().to_string();
        assert!(err.contains("plugstack.conf"), "{err}");
    }
}
