"""The sources room: every form a user can name a model or calibration data in (zoo name,
Python file, `.pt2`, calibration files and folders), loaded as data.
"""
