"""What starts or reports workflows from outside: triggers and notifications."""
