"""Scheduling: submitted specs in a specs folder, and one Airflow DAG per spec."""

from bulldozer.schedule.jobs import JobInfo, list_jobs, specs_folder, submit

__all__ = ["JobInfo", "list_jobs", "specs_folder", "submit"]
