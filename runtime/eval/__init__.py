"""``python -m runtime eval``: a job's functions over its dataset, locally, before training.

``plan`` reads the job file and the data, ``serving`` starts each function from the package
``register`` would upload, ``runner`` drives rollouts and rewards over HTTP, ``stats`` turns
the results into numbers and red flags, ``report`` writes the table, the files and the page,
``cli`` holds the command's options.
"""
