"""Onboarding commands: doctor, dry run, demo, discover, new project."""
