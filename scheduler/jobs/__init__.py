"""Jobs as their submitters see them: submit, cancel, change priority (services) and the reads
the API and pages need (selectors)."""
