"""What every part of the pipeline uses: errors, atomic writes, library output, fields."""
