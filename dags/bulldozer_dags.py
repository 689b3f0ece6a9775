"""Airflow DAG loader: one DAG per Bulldozer job spec in $BULLDOZER_SPECS_DIR
(default $BULLDOZER_HOME/specs), one task per stage. See bulldozer/schedule/airflow_dags.py."""

from bulldozer.schedule.airflow_dags import build_dags

globals().update(build_dags())
